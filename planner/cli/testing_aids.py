"""The hidden testing options' values (``--inject-fault``, ``--inject-link-delay``, ``--layer-micro-batches``)
parsed into what the profile and run Settings hold, each refused in one line naming the value."""

from planner.schemas.errors import SchemaError


def parse_delay(text: str | None) -> tuple[tuple[int, int, float], ...]:
    """``A,B,SECONDS[;A,B,SECONDS...]``: the pairs ``--inject-link-delay`` slows."""
    if text is None:
        return ()
    delays = []
    try:
        for pair in text.split(";"):
            a, b, seconds = pair.split(",")
            delays.append((int(a), int(b), float(seconds)))
    except ValueError as e:
        raise SchemaError(
            f"--inject-link-delay {text!r} must be RANK_A,RANK_B,SECONDS, pairs joined by ';', e.g. 0,1,0.01;2,3,0.01"
        ) from e
    return tuple(delays)


def parse_fault(text: str | None) -> tuple[int, str, str] | None:
    if text is None:
        return None
    rank, phase, kind = [*text.split(","), "", "", ""][:3]
    if not rank.isdigit() or kind not in ("exit", "hang"):
        raise SchemaError(f"--inject-fault {text!r} must be RANK,PHASE,exit|hang, e.g. 2,links,exit")
    return int(rank), phase, kind


def parse_micro_batches(text: str | None) -> tuple[int, ...] | None:
    """``B[,B...]``: the micro-batch sizes ``--layer-micro-batches`` times the model's layers at,
    each once, in increasing order."""
    if text is None:
        return None
    sizes = text.split(",")
    if not all(size.isdigit() and int(size) > 0 for size in sizes):
        raise SchemaError(f"--layer-micro-batches {text!r} must be positive whole numbers joined by ',', e.g. 1,2")
    return tuple(sorted({int(size) for size in sizes}))


def parse_step_fault(text: str | None) -> tuple[int, int, str, int] | None:
    """planner run's testing aid: RANK,STEP,exit|hang|slow or RANK,STEP,slow-link,PEER; the fourth
    field is the link's other end (RANK itself for the other kinds)."""
    if text is None:
        return None
    fields = text.split(",")
    rank, step, kind, peer = [*fields, "", "", "", ""][:4]
    link = kind == "slow-link" and len(fields) == 4 and peer.isdigit() and peer != rank
    if (
        not rank.isdigit()
        or not step.isdigit()
        or not (link or (kind in ("exit", "hang", "slow") and len(fields) == 3))
    ):
        raise SchemaError(
            f"--inject-fault {text!r} must be RANK,STEP,exit|hang|slow or RANK,STEP,slow-link,PEER, e.g. 2,3,exit"
        )
    return int(rank), int(step), kind, int(peer) if link else int(rank)
