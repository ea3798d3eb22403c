"""The text reading (``proxy.guard.reading``): markup residue left beside a turn's calls is not content.

A server that parses a model's tool-call template often leaves pieces of it in ``content``: an opening
marker at the end of the text (DeepSeek ``<｜DSML｜``), the Harmony header words with their special
tokens removed (``assistant`` + ``commentary`` before a call), a lone closing tag after a parsed call
(Qwen3-Coder ``</tool_call>``). Once a choice's calls are settled (structured, recovered from markup,
or both), text that consists only of such markup is stripped with a ``MARKUP_RESIDUE_IN_CONTENT``
finding; any other text stays. The readings of a held run at the end: *content* (the plain reading,
taken when the choice has no call) and *residue* (taken when it has one); a run that is not only
markup is never held.

What counts as markup (stripped): the special tokens of the dialect library (``KNOWN_TOKENS``:
``<|channel|>``, ``<|tool_call_begin|>``, ... in either bar spelling), the DSML markers (``<｜DSML｜``,
``<｜DSML｜function_calls``), the opening and closing tags of the tag dialects (``TAGS``: ``tool_call``,
``tool_calls``, ``function``, ``function_calls``, ``invoke``, ``parameter``, ``minimax:tool_call``), whole
or cut off at the end (5 characters or more); the Harmony header words (``assistant``, ``commentary``,
``analysis``, ``final``, a ``to=functions.NAME`` recipient) only when the run is the whole channel, since
prose may end with those words. Any other ``<|x|>`` or short ``<|`` is held while it may grow, then content.

``ResidueHold`` runs per choice and channel over the text the markup scanner released: it holds the
trailing run that could still be residue (at most ``MAX_RUN`` characters; a clean text delta costs one
scan for ``<``; trailing whitespace is held with the run it may lead) and releases it the moment text that
is not markup follows. Sans-IO; never raises.
"""

from __future__ import annotations

import re

from proxy.guard.dialects.tokens import NORM

#: The longest run held back as possible residue (characters); a longer run is released as text.
MAX_RUN = 160

_TAG_NAMES = ("tool_call", "tool_calls", "function_calls", "function", "invoke", "parameter",
              "minimax:tool_call")
#: The tags of the tag dialects, opening and closing, as written.
TAGS = tuple(f"<{slash}{t}>" for t in _TAG_NAMES for slash in ("", "/"))
_TAG_RX = r"</?(?:minimax:)?(?:tool_calls?|function_calls|function|invoke|parameter)>"
#: Any special-token shape: what is *held* while it may be residue (released when it is not).
_MARKER = rf"(?:<[|｜][^|｜<>\s]{{1,48}}[|｜]>?|{_TAG_RX})"
_TOKEN_END = re.compile(rf"{_MARKER}\s*\Z")
#: The special tokens of the dialect library (docs/dialects.md), bars normalised to ``|`` (``NORM``): only
#: these, the DSML markers and the tags are *stripped*; another ``<|x|>`` held at the end is content.
KNOWN_TOKENS = ("DSML", "channel", "constrain", "message", "start", "end", "call", "return", "tool_sep",
                "tool_calls_section_begin", "tool_calls_section_end", "tool_call_section_begin",
                "tool_call_section_end", "tool_call_begin", "tool_call_end", "tool_call_argument_begin",
                "tool_calls_begin", "tool_calls_end", "tool_outputs_begin", "tool_outputs_end", "im_start",
                "im_end", "eot_id", "eom_id", "python_tag", "plugin", "action_start", "action_end")
_KNOWN = "|".join(sorted(KNOWN_TOKENS, key=len, reverse=True))
_DSML = r"</?\|{1,2}DSML\|{1,2}(?:[a-z_]{1,24}>?)?"
_STRICT = rf"(?:<\|(?:{_KNOWN})\|>?|{_DSML}|{_TAG_RX})"
_STRICT_END = re.compile(rf"{_STRICT}\s*\Z")
_FULL = (*(f"<|{n}|>" for n in KNOWN_TOKENS), *TAGS)
_DSML_CUT = re.compile(r"</?\|{1,2}(?:D(?:S(?:ML?)?)?)?\Z|</?\|{1,2}DSML\|{0,2}[a-z_]{0,24}\Z")
_WORDS = r"(?:assistant|commentary|analysis|final|to=(?:functions\.)?[A-Za-z0-9_.\-]{1,64})"
_HEADER_WORDS = ("assistant", "commentary", "analysis", "final", "to=")
#: The cut-off start of a header word (``assis``, ``comm``), longest first.
_CUT_WORD = "|".join(sorted({re.escape(w[:k]) for w in _HEADER_WORDS for k in range(1, len(w))}, key=len, reverse=True))
#: A whole channel of markup and header words, the last maybe cut off (held while it may grow).
_WHOLE = re.compile(rf"(?:\s*(?:{_MARKER}|{_WORDS}))*\s*(?:<[|｜]?[^<>\s]{{0,48}}|{_CUT_WORD})?\s*")
#: A whole channel of complete markup and header words (residue when the choice has calls).
_COMPLETE_WHOLE = re.compile(rf"(?:\s*(?:{_STRICT}|{_WORDS}))+\s*")
#: Only complete known markers (no words): what may follow a call's complete arguments as residue.
_MARKERS_ONLY = re.compile(rf"(?:\s*{_STRICT})+\s*")


#: End-of-turn special tokens (ChatML, Llama 3, Phi, GPT-2 family): a text that ends with only these ended
#: with the chat template's end of turn, not with content (TGI, BerriAI/litellm#3757).
END_TOKENS = ("im_end", "eot_id", "eom_id", "end", "endoftext", "end_of_turn")
_END_ALT = "|".join(sorted(END_TOKENS, key=len, reverse=True))
_END_RUN = re.compile(rf"(?:\s*<\|(?:{_END_ALT})\|>)+\s*")


def end_of_turn(text: str) -> bool:
    """True when ``text`` (a held run at the end of a channel) is nothing but end-of-turn tokens
    (``END_TOKENS``, either bar spelling) and whitespace."""
    return 0 < len(text) <= MAX_RUN and bool(text.strip()) and _END_RUN.fullmatch(text.translate(NORM)) is not None


def only_markup(text: str) -> bool:
    """True when ``text`` is nothing but complete known markers of the dialect library (``KNOWN_TOKENS``,
    DSML, the tag dialects' tags) and whitespace: a Hermes ``</tool_call>`` left after a call's complete
    arguments (SiliconFlow Qwen3-8B, anomalyco/opencode#17750). At most ``MAX_RUN`` characters."""
    return 0 < len(text) <= MAX_RUN and bool(text.strip()) and _MARKERS_ONLY.fullmatch(text.translate(NORM)) is not None


def _partial(piece: str) -> bool:
    """True when ``piece`` (from a ``<`` to the end of the text) is the cut-off start of a marker."""
    if piece == "<":
        return True  # held: the next delta may make it a marker
    if any(c.isspace() for c in piece) or ">" in piece:
        return False
    if piece[1] in "|｜":
        return len(piece) <= 50 and piece.count(piece[1]) <= 2
    return any(t.startswith(piece) for t in TAGS)


def _strict_partial(piece: str) -> bool:
    """True when ``piece`` is the cut-off start (5 characters or more) of a known marker (``_FULL``, DSML)."""
    norm = piece.translate(NORM)
    return len(norm) >= 5 and (any(f.startswith(norm) for f in _FULL) or _DSML_CUT.match(norm) is not None)


def tail_run(text: str, *, strict: bool = False) -> int:
    """Where the trailing run of markup (complete tokens, then maybe a cut-off one) starts in ``text``;
    ``len(text)`` when there is none. Looks at most ``MAX_RUN`` characters back. ``strict``: only the
    known markers (what is stripped); else any marker shape (what is held)."""
    partial, token_end = (_strict_partial, _STRICT_END) if strict else (_partial, _TOKEN_END)
    if strict:
        text = text.translate(NORM)
    floor = max(0, len(text) - MAX_RUN)
    pos = len(text)
    while pos > floor and text[pos - 1].isspace():
        pos -= 1  # trailing whitespace is held with the run it may lead (content again if none follows)
    lt = text.rfind("<", floor, pos)
    if lt < 0:
        return pos
    if partial(text[lt:pos]):
        pos = lt
        while pos > floor and text[pos - 1].isspace():
            pos -= 1
    while pos > floor:
        m = token_end.search(text, max(floor, pos - 60), pos)
        if m is None:
            break
        pos = m.start()
        while pos > floor and text[pos - 1].isspace():
            pos -= 1
    return pos


class ResidueHold:
    """Holds a channel's trailing run of possible markup residue (module docstring).

    ``feed(text)`` returns the text to release now; ``held`` is the run held back; ``residue()`` says
    whether the held run is markup (strip it when the choice has calls), else it is content.
    """

    __slots__ = ("held", "_start")

    def __init__(self) -> None:
        self.held = ""
        self._start = True  # nothing released yet: the run is the whole channel (header words count)

    def feed(self, text: str) -> str:
        """Take released ``text``; return what can go to the client now."""
        if not text:
            return ""
        run = self.held + text
        if self._start:
            if len(run) <= MAX_RUN and _WHOLE.fullmatch(run) is not None:
                self.held = run
                return ""
            self._start = False
        elif not self.held and "<" not in text and not text[-1].isspace():
            return text  # the clean case: no marker can start in this delta
        cut = tail_run(run)
        self.held = run[cut:]
        return run[:cut]

    def residue(self) -> bool:
        """True when the held run is markup: complete tokens (a cut-off one last), or for a whole channel
        complete markup and header words."""
        text = self.held
        if text.strip() in ("", "<"):
            return False
        if self._start and _COMPLETE_WHOLE.fullmatch(text.translate(NORM)) is not None:
            return True
        return tail_run(text, strict=True) == 0
