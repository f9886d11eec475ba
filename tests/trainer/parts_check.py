#!/usr/bin/env python3
"""Checks the trainer's parts against worker/trainer/PARTS: every source file of a part includes
only its own part's headers and those of the parts it may call, and every folder is a part."""

import pathlib
import re
import sys


def main(root: pathlib.Path) -> int:
    trainer = root / "worker" / "trainer"
    allowed = {}
    for line in (trainer / "PARTS").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, calls = line.partition(":")
        allowed[name.strip()] = set(calls.split())
    errors = []
    for name, calls in allowed.items():
        for unknown in calls - allowed.keys():
            errors.append(f"PARTS: {name} may call {unknown}, which is not a part")
    for folder in sorted(p for p in trainer.iterdir() if p.is_dir()):
        if folder.name not in allowed:
            errors.append(f"{folder.relative_to(root)}: a folder that PARTS does not list")
    include = re.compile(r'^\s*#\s*include\s+"worker/trainer/([^/"]+)/', re.M)
    for path in sorted(trainer.rglob("*")):
        if path.suffix not in (".h", ".cc") or path.parent == trainer:
            continue
        part = path.relative_to(trainer).parts[0]
        if part not in allowed:
            continue
        for used in include.findall(path.read_text()):
            if used != part and used not in allowed[part]:
                errors.append(f"{path.relative_to(root)}: part {part} includes {used}/, "
                              f"which it may not call (PARTS: {part}: "
                              f"{' '.join(sorted(allowed[part])) or 'nothing'})")
    for e in errors:
        print(e)
    print(f"parts_check: {len(allowed)} parts, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
