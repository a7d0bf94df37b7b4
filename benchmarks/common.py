"""Shared by the benchmark sections: one printed line per figure, kept for RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
from dataclasses import dataclass, field


@dataclass
class Figure:
    section: str
    name: str
    value: str  # absolute values, in words
    ratio: str  # against the baseline measured in the same run
    target: str
    met: bool | None  # None: no target, or not measurable here

    def line(self) -> str:
        verdict = {True: "MET", False: "NOT MET", None: "n/a"}[self.met]
        return f"[{self.section}] {self.name}: {self.value}; {self.ratio}; target {self.target}: {verdict}"


@dataclass
class Report:
    quick: bool = False
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)  # "## Title" -> Markdown, written after the notes

    def add(self, fig: Figure) -> None:
        self.figures.append(fig)
        print(fig.line(), flush=True)

    def note(self, section: str, text: str) -> None:
        self.notes.append(f"[{section}] {text}")
        print(f"[{section}] note: {text}", flush=True)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def today() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
