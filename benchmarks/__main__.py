"""``python -m benchmarks [--quick] [--only cycle,quality,control,launch,burst] [--results FILE]``.

Every figure is one printed line: absolute values, a ratio against a baseline measured in the same
run, the target and whether it is met.  The full run writes ``benchmarks/RESULTS.md`` (machine, date,
every line and note); ``--quick`` runs tiny sizes (to prove the harness works) and writes nothing
unless ``--results`` is given.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
from pathlib import Path

from benchmarks.common import Report, machine, today

SECTIONS = ("cycle", "quality", "control", "launch", "burst")


def write_results(report: Report, path: Path, argv: list[str], wall_s: float,
                  ran: tuple[str, ...] = SECTIONS) -> None:
    """Write the results file.  Figure and note lines of sections this run did not run (``--only``)
    are kept from the existing file, marked with the date they came from; so are its hand-written
    ``## `` sections, after the generated ones."""
    old_figs, old_notes = _lines_of_other_sections(path, ran)
    lines = ["# gsched benchmark results", "",
             f"- date: {today()}", f"- machine: {machine()}",
             f"- command: `{' '.join(['python -m benchmarks', *argv])}`", f"- wall time: {wall_s:.0f} s", "",
             "Each line: absolute values; the ratio against the baseline measured in the same run; the target.",
             "Section docstrings in `benchmarks/*.py` describe each set-up."]
    lines += ["", "## Figures", ""]
    lines += [f"- {f.line()}" for f in report.figures] + old_figs
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report.notes] + old_notes + [""]
    for title, body in report.sections.items():
        lines += [title, "", body.rstrip(), ""]
    kept = _hand_written_sections(path, tuple(report.sections))
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""))


GENERATED = ("## Figures", "## Notes")
KEPT = "(from the run of "


def _tag(line: str) -> str:
    """The section of a figure or note line ("- [cycle] ..." -> "cycle")."""
    return line.removeprefix("- [").split("]", 1)[0]


def _lines_of_other_sections(path: Path, ran: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(figure lines, note lines) of the existing file's sections that are not in ``ran``, each marked
    "(from the run of DATE)" once, with the date of the file it first came from."""
    if not path.is_file():
        return [], []
    figs: list[str] = []
    notes: list[str] = []
    date = ""
    part = None
    for line in path.read_text().splitlines():
        if line.startswith("- date: ") and not date:
            date = line.removeprefix("- date: ").split(" (", 1)[0]
        if line.startswith("## "):
            part = line.strip()
        elif line.startswith("- [") and part in GENERATED and _tag(line) not in ran:
            if KEPT not in line:
                line = f"{line} {KEPT}{date})"
            (figs if part == "## Figures" else notes).append(line)
    return figs, notes


def _hand_written_sections(path: Path, generated: tuple[str, ...] = ()) -> str:
    """The ``## `` sections of an existing results file that a run does not generate (device figures,
    caveats, separately run sections, the quality grid of a run without ``quality``): a new run keeps
    them after its own."""
    if not path.is_file():
        return ""
    kept: list[str] = []
    keep = False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            keep = line.strip() not in GENERATED + generated
        if keep:
            kept.append(line)
    return "\n".join(kept).strip() + "\n" if kept else ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: proves the harness, measures nothing")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    p.add_argument("--results", default=None, help="where to write the results (default benchmarks/RESULTS.md "
                   "for a full run, nowhere for --quick)")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SECTIONS]
    if bad:
        p.error(f"--only: unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    report = Report(quick=args.quick)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind, so every section's finally stops its processes

    signal.signal(signal.SIGTERM, on_term)
    print(f"gsched benchmarks on {machine()}, {today()}{' (quick)' if args.quick else ''}", flush=True)
    t0 = time.perf_counter()
    for name in chosen:
        t = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").run(report)
        report.note(name, f"section took {time.perf_counter() - t:.0f} s")
    out = args.results or (None if args.quick else str(Path(__file__).with_name("RESULTS.md")))
    if out:
        write_results(report, Path(out), argv, time.perf_counter() - t0, tuple(chosen))
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
