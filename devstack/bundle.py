"""The deploy archive, built from the same file selection Terraform deploys.

`infra/bundle.tf` holds the selection once (`bundle_patterns`, `bundle_excludes`). This module
reads those lists with python-hcl2 and applies Terraform's `fileset()` semantics to them, so
the archive tests unpack and serve holds exactly the files Cloud Build uploads.

    python -m devstack.bundle OUT.zip     # prints the archive path, file count and content hash
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import os
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"

# A fixed timestamp makes the zip bytes depend on content only (1980-01-01 is zip's epoch).
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Selection:
    patterns: tuple[str, ...]
    excludes: tuple[str, ...]


@functools.cache
def parse_terraform(path: Path) -> dict[str, Any]:
    """One .tf file as plain dicts. The first parse builds hcl2's grammar (~3 s), so every
    parse is cached for the life of the process."""
    import hcl2
    from hcl2 import SerializationOptions

    with path.open(encoding="utf-8") as f:
        parsed: dict[str, Any] = hcl2.load(
            f,
            serialization_options=SerializationOptions(
                strip_string_quotes=True, explicit_blocks=False
            ),
        )
    return parsed


def terraform_locals(infra: Path = INFRA) -> dict[str, Any]:
    """Every `locals` entry declared in infra/*.tf (expressions stay strings)."""
    found: dict[str, Any] = {}
    for tf in sorted(infra.glob("*.tf")):
        for block in parse_terraform(tf).get("locals", []):
            found.update(block)
    return found


def read_selection(infra: Path = INFRA) -> Selection:
    declared = terraform_locals(infra)
    try:
        patterns = declared["bundle_patterns"]
        excludes = declared.get("bundle_excludes", [])
    except KeyError:
        raise SystemExit(f"{infra}: no `bundle_patterns` in any locals block") from None
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise SystemExit(f"{infra}: bundle_patterns must be a list of string literals")
    return Selection(tuple(patterns), tuple(excludes))


def _match_segments(pattern: Sequence[str], path: Sequence[str]) -> bool:
    """doublestar matching, as Terraform's fileset() does it: `**` spans zero or more whole
    path segments; `*`, `?` and `[...]` stay inside one segment."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_segments(rest, path[i:]) for i in range(len(path) + 1))
    if not path:
        return False
    return fnmatch.fnmatchcase(path[0], head) and _match_segments(rest, path[1:])


def matches(pattern: str, relpath: str) -> bool:
    return _match_segments(pattern.split("/"), relpath.split("/"))


def _all_files(root: Path) -> Iterable[str]:
    # fileset() returns regular files only, and does not descend through directory symlinks.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not Path(dirpath, d).is_symlink()]
        for name in filenames:
            full = Path(dirpath, name)
            if full.is_file():
                yield full.relative_to(root).as_posix()


def select_files(selection: Selection, root: Path = ROOT) -> list[str]:
    """Relative POSIX paths, sorted, as `local.bundle_files` in infra/bundle.tf."""
    chosen = set()
    for rel in _all_files(root):
        if any(matches(p, rel) for p in selection.patterns) and not any(
            matches(x, rel) for x in selection.excludes
        ):
            chosen.add(rel)
    return sorted(chosen)


def content_hash(files: Sequence[str], root: Path = ROOT) -> str:
    """`local.bundle_hash`: sha256 over "<path> <sha256 of its bytes>" lines."""
    lines = [f"{rel} {hashlib.sha256((root / rel).read_bytes()).hexdigest()}" for rel in files]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def build_archive(dest: Path, root: Path = ROOT, infra: Path = INFRA) -> Path:
    """Zip the selected files of `root` into `dest` (parents created) and return `dest`."""
    files = select_files(read_selection(infra), root)
    if "main.py" not in files or "requirements.txt" not in files:
        raise SystemExit("the bundle must hold main.py and requirements.txt at its root")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for rel in files:
            info = zipfile.ZipInfo(rel, date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (root / rel).read_bytes())
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the deploy archive as infra/ selects it.")
    parser.add_argument("out", type=Path, help="path of the zip to write")
    args = parser.parse_args(argv)
    files = select_files(read_selection())
    out = build_archive(args.out)
    print(f"{out}: {len(files)} files, content hash {content_hash(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
