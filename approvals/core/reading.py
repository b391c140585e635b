"""How a value reads to a person: characters that are invisible or look like others.

A model writes the arguments an approver reads, so anything it can put in them must show as what
it is. Invisible characters (bidi overrides, zero-width characters, other format and control
characters, unusual spaces) are shown as visible escapes such as ⟨U+202E⟩, and a word that mixes
scripts, or is written wholly in letters of another script that look Latin (Unicode TR39's
mixed-script and whole-script confusables, for the letters that matter in practice), is flagged.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

# Spaces a person cannot tell from nothing, or from an ordinary space.
_BLANK_LOOKING = frozenset(
    "\u00a0\u115f\u1160\u2800\u3164\uffa0"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
)

# Letters of other scripts that read as Latin ones in the console's fonts (the common cases of
# Unicode's confusables.txt): a word made only of these, or mixing them with Latin, is flagged.
_LATIN_LOOKALIKES = frozenset(
    # Cyrillic
    "аеорсухіјѕԁһӏԛԝвкмнтАВЕКМНОРСТУХІЈЅԚԜ"
    # Greek
    "αεικνορτυχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"
    # Armenian and others often used the same way
    "օսոհցզ"
)


def is_invisible(char: str) -> bool:
    """A character that shows as nothing, or as an ordinary space, or reorders what follows."""
    if char in " \n":
        return False
    if char in _BLANK_LOOKING:
        return True
    return unicodedata.category(char) in {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"}


def _plain(text: str) -> bool:
    # Printable ASCII has no invisible character and no letter of another script: the common
    # case, answered without looking at each character.
    return text.isascii() and text.isprintable()


def escape(text: str) -> str:
    """The text with every invisible character written as ⟨U+XXXX⟩."""
    if _plain(text):
        return text
    return "".join(f"⟨U+{ord(c):04X}⟩" if is_invisible(c) else c for c in text)


def _script(char: str) -> str:
    name = unicodedata.name(char, "")
    return name.split(" ", 1)[0] if name else ""


def _words(text: str) -> list[str]:
    word, words = [], []
    for char in text:
        if char.isalpha() or is_invisible(char) and unicodedata.category(char) == "Cf":
            word.append(char)
        elif word:
            words.append("".join(word))
            word = []
    if word:
        words.append("".join(word))
    return words


def lookalike_words(text: str) -> list[str]:
    """Words of the text that mix scripts, or pass for Latin in another script's letters."""
    found = []
    for word in _words(text):
        letters = [c for c in word if c.isalpha()]
        scripts = {_script(c) for c in letters}
        if len(scripts) > 1 or (
            len(letters) > 1
            and "LATIN" not in scripts
            and all(c in _LATIN_LOOKALIKES for c in letters)
        ):
            found.append(word)
    return found


@dataclass(frozen=True)
class Flag:
    """Something about a call a person must see before approving it."""

    where: str  # the argument's path as shown
    kind: str  # "invisible", "lookalike"
    detail: str

    @property
    def sentence(self) -> str:
        return f"{self.where}: {self.detail}"


def _invisible_detail(text: str) -> str:
    seen = []
    for char in text:
        if is_invisible(char):
            label = f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed character').lower()}"
            if label not in seen:
                seen.append(label)
    return "invisible characters " + ", ".join(seen)


def flags_in(text: str, where: str) -> list[Flag]:
    if _plain(text):
        return []
    flags = []
    if any(is_invisible(c) for c in text):
        flags.append(Flag(where, "invisible", _invisible_detail(text)))
    words = lookalike_words(text)
    if words:
        shown = ", ".join(escape(w) for w in words[:3])
        flags.append(
            Flag(where, "lookalike", f"letters of another script that look Latin ({shown})")
        )
    return flags


def flags_of(value: Any, path: str = "") -> list[Flag]:
    """Every flag of a JSON value: in its keys and in its strings, at any depth."""
    from_here: list[Flag] = []
    if isinstance(value, dict):
        for key, item in value.items():
            child = join_path(path, key)
            key_text = str(key)
            from_here += [
                Flag(child, f.kind, "the name has " + f.detail) for f in flags_in(key_text, child)
            ]
            if key_text != key_text.strip():
                from_here.append(Flag(child, "invisible", "the name starts or ends with a space"))
            from_here += flags_of(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            from_here += flags_of(item, f"{path}[{index}]")
    elif isinstance(value, str):
        from_here += flags_in(value, path or "(value)")
    return from_here


def join_path(path: str, key: Any) -> str:
    """A child's path, written so that no two different structures read alike: a plain name
    after a dot, anything else quoted in brackets (so {"x.y": 1} is ["x.y"], not x.y)."""
    text = str(key)
    plain = text.isidentifier() and text.isascii()
    if plain:
        return f"{path}.{text}" if path else text
    quoted = '"' + escape(text).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{path}[{quoted}]"


def normalised(text: str) -> str:
    """The form automatic rules compare: NFKC, case-folded, invisible characters removed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(c for c in folded if not is_invisible(c)).strip()
