"""The model map's page: one self-contained HTML file around the assembled data.

Everything the page needs travels inside it (plotly.js, the data, the script and
the style), so it opens offline from a file and makes no network request.
"""

import html
import json
import re
from importlib import resources

__all__ = ["render_html"]

# The page, its style and its script are files beside this module, so that
# editors and linters read them as HTML, CSS and JavaScript.
_PARTS = resources.files("sklocus.report") / "page"


def _part(name):
    return (_PARTS / name).read_text(encoding="utf-8")


def _json_for_script(data):
    """Serialise ``data`` so that no string in it can close the script element."""
    text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    # "<\/" is the same string to JSON, but no longer an end tag to HTML; "<!--"
    # would otherwise change how the HTML parser reads the rest of the script.
    return text.replace("</", "<\\/").replace("<!--", "\\u003c!--")


def render_html(data, title):
    """Render the model map as one self-contained HTML page.

    Parameters
    ----------
    data : dict
        The map's content as assembled by :mod:`sklocus.report` (model names,
        3-D coordinates, colours, neighbours, portfolio orders, convergence).
        It must be JSON-serialisable; missing numbers are ``None``, not NaN.
    title : str
        The page's title, shown in its header.

    Returns
    -------
    page : str
        The HTML page, with plotly.js, the data and the script inline, so that
        it opens from a file with no network access.
    """
    # plotly is an optional dependency (the [report] extra): import it only here
    # so that `import sklocus` stays light.
    from plotly.offline import get_plotlyjs

    replacements = {
        "@TITLE@": html.escape(title),
        "@VERSION@": html.escape(str(data.get("sklocus_version", ""))),
        "@STYLE@": _part("map.css"),
        "@SCRIPT@": _part("map.js"),
        "@DATA@": _json_for_script(data),
        "@PLOTLY@": get_plotlyjs(),
    }
    # One pass, so that placeholder-like text inside a model name, the title or
    # plotly.js is never replaced in turn.
    page = _part("map.html")
    return re.sub("@[A-Z]+@", lambda match: replacements[match.group()], page)
