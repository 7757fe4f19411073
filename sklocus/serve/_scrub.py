"""Cut an API key's fragments out of what an upstream sends back.

An upstream may quote its caller's key: whole in an error ("invalid key
sk-..."), split across words, re-cased, partly masked (``sk-abc***xyz``), one
character short in an error's ``param``, in a header, or echoed in a 200 body.
Replacing the exact key misses all but the first, so :class:`KeyScrubber` cuts
every run of 8 or more characters that occurs in the key, in any case (ASCII
case folding: keys are ASCII), from text and from bytes; a stream is scrubbed
part by part, holding back only the run of the key's characters that ends a
part (at most the key's length), which the next part may continue.
"""

from __future__ import annotations

import re

# The shortest run of a key's characters that is cut out: shorter runs (``sk-``,
# a word of an error) would also cut what the upstream said for itself.
FRAGMENT_CHARS = 8
_CUT = b"[key]"


class KeyScrubber:
    """Find and cut out fragments of one key.

    Parameters
    ----------
    key : str
        An ASCII key; a key shorter than :data:`FRAGMENT_CHARS` is cut out whole.
    """

    def __init__(self, key):
        self._key = key.encode("ascii").lower()
        self._width = min(FRAGMENT_CHARS, len(self._key))
        grams = {
            self._key[start : start + self._width]
            for start in range(len(self._key) - self._width + 1)
        }
        # Longest first: the regular expression takes the first alternative.
        self._pattern = re.compile(
            b"|".join(re.escape(gram) for gram in sorted(grams, reverse=True))
        )

    def _spans(self, lowered):
        """Yield ``(start, end)`` of each maximal run of the key's characters."""
        position = 0
        while True:
            found = self._pattern.search(lowered, position)
            if found is None:
                return
            start, end = found.span()
            while end < len(lowered) and lowered[start : end + 1] in self._key:
                end += 1
            yield start, end
            position = end

    def bytes(self, data):
        """Return ``data`` with every fragment of the key replaced by ``[key]``."""
        lowered = data.lower()
        pieces, kept = [], 0
        for start, end in self._spans(lowered):
            pieces += [data[kept:start], _CUT]
            kept = end
        if not pieces:
            return data
        pieces.append(data[kept:])
        return b"".join(pieces)

    def text(self, text):
        """Return ``text`` with every fragment of the key replaced by ``[key]``."""
        data = text.encode("utf-8", errors="surrogatepass")
        scrubbed = self.bytes(data)
        if scrubbed is data:
            return text
        return scrubbed.decode("utf-8", errors="replace")

    def stream(self):
        """Return a :class:`StreamScrubber` for one body read in parts."""
        return StreamScrubber(self)

    def _open_end(self, data):
        """Length of the longest end of ``data`` that occurs in the key.

        What a following part may continue into a fragment, so it is held.
        """
        tail = data[-len(self._key) :].lower()
        for size in range(len(tail), 0, -1):
            if tail[-size:] in self._key:
                return size
        return 0


class StreamScrubber:
    """Scrub a body part by part, a fragment split between parts included.

    Parameters
    ----------
    scrubber : KeyScrubber
    """

    def __init__(self, scrubber):
        self._scrubber = scrubber
        self._held = b""

    def feed(self, part):
        """Return what of ``part`` (after what was held back) may go out now."""
        data = self._held + part
        held = self._scrubber._open_end(data)
        self._held = data[len(data) - held :]
        return self._scrubber.bytes(data[: len(data) - held])

    def end(self):
        """Return what was held back, once the body has ended."""
        held, self._held = self._held, b""
        return self._scrubber.bytes(held)
