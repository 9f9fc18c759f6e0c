"""Where the test suite's time goes, from `pytest --time-breakdown PATH`'s JSON lines.

  .venv/bin/python -m pytest -n 2 --time-breakdown /tmp/times.jsonl
  .venv/bin/python scripts/suite_profile.py /tmp/times.jsonl*

Prints the summed test seconds split into XLA compiles, tracing + lowering, subprocesses'
CPU and the rest (compute and Python), then the files and tests that take the most.
"""

import argparse
import collections
import json
import sys


def load(paths: list[str]) -> list[dict]:
  records = []
  for path in paths:
    with open(path, encoding="utf-8") as lines:
      records.extend(json.loads(line) for line in lines if line.strip())
  return records


def summary(records: list[dict], top: int) -> str:
  wall = sum(r["wall"] for r in records)
  compile_s = sum(r["compile"] for r in records)
  trace = sum(r["trace_lower"] for r in records)
  children = sum(r["children_cpu"] for r in records)
  rest = wall - compile_s - trace - children
  lines = [
    f"{len(records)} tests, {wall:.0f} s summed over workers "
    f"({sum(r['slow'] for r in records)} slow tests: "
    f"{sum(r['wall'] for r in records if r['slow']):.0f} s)",
    f"  XLA compiles     {compile_s:8.0f} s  {100 * compile_s / wall:5.1f}%  "
    f"({sum(r['compiles'] for r in records)} programs)",
    f"  tracing+lowering {trace:8.0f} s  {100 * trace / wall:5.1f}%",
    f"  subprocess CPU   {children:8.0f} s  {100 * children / wall:5.1f}%",
    f"  the rest         {rest:8.0f} s  {100 * rest / wall:5.1f}%  (compute, Python, waits)",
  ]
  failed = [r["test"] for r in records if r.get("outcome") == "failed"]
  if failed:
    lines += [f"  failed: {len(failed)}"] + [f"    {name}" for name in failed]
  lines += [
    "",
    "files (s, compile s, subprocess s, tests):",
  ]
  by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
  for r in records:
    entry = by_file[r["test"].split("::")[0]]
    entry[0] += r["wall"]
    entry[1] += r["compile"] + r["trace_lower"]
    entry[2] += r["children_cpu"]
    entry[3] += 1
  for name, (w, c, ch, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
    lines.append(f"  {w:7.1f} {c:7.1f} {ch:7.1f} {n:4d}  {name}")
  lines += ["", "tests (s, compile s, subprocess s):"]
  for r in sorted(records, key=lambda r: -r["wall"])[:top]:
    mark = " [slow]" if r["slow"] else ""
    lines.append(
      f"  {r['wall']:7.1f} {r['compile'] + r['trace_lower']:7.1f} {r['children_cpu']:7.1f}  "
      f"{r['test']}{mark}"
    )
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("paths", nargs="+", help="--time-breakdown files (one per worker)")
  parser.add_argument("--top", type=int, default=30, help="files and tests listed (30)")
  args = parser.parse_args(argv)
  print(summary(load(args.paths), args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main())
