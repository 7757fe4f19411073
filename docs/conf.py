"""Sphinx configuration of the sklocus documentation.

Build from the repository root, after ``pip install -e ".[docs]"``::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

That runs every example of the gallery and shows its output.
``-D plot_gallery=0`` renders the gallery from the scripts without running any
of them, as ``tests/test_docs.py`` does.
"""

import sklocus

project = "sklocus"
author = "The sklocus developers"
copyright = "The sklocus developers, BSD-3-Clause"
release = sklocus.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
# generated/ holds autosummary's stub pages and auto_examples/ the gallery, both
# written by the build and ignored by git.
exclude_patterns = ["_build", "_templates"]

# -- API reference ----------------------------------------------------------------

autosummary_generate = True
# numpydoc renders the Parameters, Returns and Attributes of each docstring. The
# class template (_templates/autosummary/class.rst) documents each class's methods
# itself, so numpydoc's own tables of members would list them twice.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
autodoc_typehints = "none"
autodoc_member_order = "bysource"

# -- Gallery ------------------------------------------------------------------------


def _quick_start_first(filename):
    """Order of the gallery: the quick start, then the others by file name."""
    return (filename != "quick_start.py", filename)


# Sphinx warns that it cannot cache sphinx_gallery_conf, which holds a function
# (the order above). The gallery settings are read from this file on every build
# anyway, and an incremental build still reuses the pages it has read.
suppress_warnings = ["config.cache"]


sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    # A full build runs every example (each takes well under a minute) and shows
    # its output; -D plot_gallery=0 shows them as code without running any.
    "filename_pattern": r"\.py$",
    "within_subsection_order": _quick_start_first,
    "download_all_examples": False,
    "remove_config_comments": True,
}

# -- Markdown pages -----------------------------------------------------------------

# The research notes and the performance page are Markdown written (in part) by the
# scripts of benchmarks/ and research/; they are included as they are.
suppress_warnings += [
    # research/transfer.md, written by research/transfer_report.py, puts its
    # fold-by-fold tables (###) directly under the page title (#). The page reads
    # correctly; only the skipped level is reported.
    "myst.header",
]

# -- HTML -----------------------------------------------------------------------------

html_theme = "alabaster"
html_title = f"sklocus {release}"
html_theme_options = {
    "description": "LOCUS model embeddings for scikit-learn",
    "fixed_sidebar": True,
}
html_show_sourcelink = False


def _skip_foreign_member(app, what, name, obj, skip, options):
    """Leave out class members that scikit-learn, torch or Python define.

    ``get_params``, ``set_output``, ``set_fit_request``, torch's ``Module.to`` and
    the like are documented by their own projects, and their docstrings refer to
    pages of those projects that this site does not have. Members sklocus defines
    are kept, inherited ones included (the selectors' ``predict`` and
    ``transform`` come from their shared base class).
    """
    if what != "class":
        return None
    defined_in = getattr(getattr(obj, "fget", obj), "__module__", None)
    if not (isinstance(defined_in, str) and defined_in.startswith("sklocus")):
        return True
    return None


# Modules whose names sklocus re-exports; the API reference documents those names
# once, under sklocus.
_REEXPORTING = ("sklocus.encoders.", "sklocus.evaluations.")


def _link_reexports(app, env, node, contnode):
    """Resolve ``sklocus.encoders.SentenceEncoder`` and the like to their pages.

    Docstrings name a re-exported object by either path; its page is under
    ``sklocus`` (``sklocus.SentenceEncoder``).
    """
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith(_REEXPORTING):
        return None
    rest = target.split(".", 2)[2]
    if rest.split(".")[0] not in sklocus.__all__:
        return None
    return env.get_domain("py").resolve_xref(
        env,
        node["refdoc"],
        app.builder,
        node["reftype"],
        f"sklocus.{rest}",
        node,
        contnode,
    )


def setup(app):
    """Connect the member filter and the links to re-exported names."""
    app.connect("autodoc-skip-member", _skip_foreign_member)
    app.connect("missing-reference", _link_reexports)
