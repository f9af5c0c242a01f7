"""Layer trace: text helpers of the trace table and the Chrome export. Imports nothing of dnnbind."""

from __future__ import annotations


def chrome_event(name: str, cat: str, tid: int, ts: float, dur: float, args: dict) -> dict:
    """One complete ("X") event of the trace-event JSON format; times in µs."""
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "cat": cat, "ts": round(ts, 3),
            "dur": round(max(dur, 0.0), 3), "args": args}


def us(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_details(d: dict) -> str:
    """``algo=... workspace=3.0MiB x=(64,1,28,28)``: byte counts scaled, tuples without spaces."""
    out = []
    for k, v in d.items():
        if k.endswith("_bytes"):
            k, v = k[:-6], (f"{v / 2**20:.1f}MiB" if v >= 2**20 else f"{v / 2**10:.1f}KiB" if v >= 2**10 else f"{v}B")
        elif isinstance(v, (tuple, list)):
            v = "(" + ",".join(str(x) for x in v) + ")"
        out.append(f"{k}={v}")
    return " ".join(out)


def clip(text: str, width: int, left: bool = False) -> str:
    if len(text) <= width:
        return text
    return "..." + text[3 - width:] if left else text[:width - 3] + "..."


def short_kernel(name: str, width: int) -> str:
    """A demangled kernel name made to fit ``width`` for the table (records keep the full name): the ``void``
    every kernel returns goes, then the parameter list becomes ``(...)``, then template arguments nested in
    template arguments become ``<...>``, and what is still too long is clipped."""
    name = name.removeprefix("void ")
    if len(name) > width and name.endswith(")"):
        i = _opening(name, len(name) - 1)
        if i > 0:
            name = name[:i] + "(...)"
    if len(name) > width:
        out, depth = [], 0
        for ch in name:
            if ch == "<":
                depth += 1
                if depth <= 2:
                    out.append("<" if depth == 1 else "<...>")
            elif ch == ">":
                depth -= 1
                if depth < 0:  # an operator> or a "->": leave the brackets alone
                    return clip(name, width)
                if depth == 0:
                    out.append(">")
            elif depth < 2:
                out.append(ch)
        name = "".join(out)
    return clip(name, width)


def _opening(text: str, end: int) -> int:
    """Index of the bracket that opens the one at ``end`` (``(`` and ``<`` nest alike); -1 if none."""
    depth = 0
    for i in range(end, -1, -1):
        ch = text[i]
        if ch in ")>":
            depth += 1
        elif ch in "(<":
            depth -= 1
            if depth == 0:
                return i
    return -1


def columns(head: tuple, rows: list, right: tuple, extra: dict | None = None) -> list[str]:
    """Aligned lines: ``head``, then each row followed by its ``extra`` lines; columns in ``right`` right-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(head).rstrip()]
    for i, row in enumerate(rows):
        out += [line(row).rstrip(), *(extra or {}).get(i, ())]
    return out
