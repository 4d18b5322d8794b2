"""Write the docs' code samples out in their pages, from the files that tests run.

A page shows a sample as ``<!-- snippet: path[:region] -->`` followed by a fenced block
holding that file (or the part between its ``# --8<-- [start:region]`` and
``[end:region]`` markers), character for character: the page reads as plain Markdown on
GitHub and PyPI, and ``tests/test_docs.py`` fails when a block and its file differ.

    python scripts/inline_snippets.py          # rewrite the blocks from their files
    python scripts/inline_snippets.py --check  # exit 1, naming the pages, if one differs

An include left in a page (``--8<-- "path[:region]"`` alone in a fence, the mkdocs
snippets syntax) is written out the same way.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: an include alone in a fenced block: the fence's opening line, then the target
INCLUDE_BLOCK = re.compile(r'^```(\w*)([^\n]*)\n-+8<-+\s+"([^"]+)"\s*\n```[ \t]*$', re.MULTILINE)
#: a sample written out in a page, and the file it copies
INLINED = re.compile(r"^<!-- snippet: (\S+) -->\n```(\w*)([^\n]*)\n(.*?)^```[ \t]*$",
                     re.MULTILINE | re.DOTALL)  # fmt: skip
REGION_MARKER = re.compile(r"^\s*# -+8<-+ \[(start|end):\w+\]\s*$")


def pages() -> list[Path]:
    return sorted((ROOT / "docs").glob("**/*.md"))


def snippet_text(target: str) -> str:
    """The text of ``path[:region]`` as a page shows it (region markers left out)."""
    path, _, region = target.partition(":")
    text = (ROOT / path).read_text()
    if region:
        start, end = f"[start:{region}]", f"[end:{region}]"
        text = text[text.index(start):text.index(end)].split("\n", 1)[1].rsplit("\n", 1)[0]
    return "\n".join(ln for ln in text.splitlines() if not REGION_MARKER.match(ln)) + "\n"


def inlined(page_text: str) -> str:
    """``page_text`` with every include written out and every written-out block refreshed."""
    def block(target: str, lang: str, attrs: str) -> str:
        return f"<!-- snippet: {target} -->\n```{lang}{attrs}\n{snippet_text(target)}```"

    text = INCLUDE_BLOCK.sub(lambda m: block(m[3], m[1], m[2]), page_text)
    return INLINED.sub(lambda m: block(m[1], m[2], m[3]), text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = [page for page in pages() if inlined(page.read_text()) != page.read_text()]
    for page in stale:
        if check:
            print(f"{page.relative_to(ROOT)}: a sample is not written out as its file; run "
                  "`python scripts/inline_snippets.py`")  # fmt: skip
        else:
            page.write_text(inlined(page.read_text()))
            print(f"rewrote {page.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
