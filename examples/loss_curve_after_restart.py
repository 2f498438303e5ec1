"""Print a resumed run's loss curve beside the uninterrupted reference's, and the time from a
failure to the first new step (the examples elastic_restart.sh and replan_after_failure.sh).

Usage: loss_curve_after_restart.py REFERENCE.json RESUMED.json LABEL FAILED_AT_S FIRST_STEP_AT WHAT
  REFERENCE.json, RESUMED.json: `planner run --report` files of the 4-rank uninterrupted run and
      of the run resumed from a checkpoint; LABEL names the resumed run ("resumed", "restarted");
  FAILED_AT_S: the failure's time in seconds since the epoch (`date +%s.%N`);
  FIRST_STEP_AT: the ISO time the log gives for the first step after the resume;
  WHAT: what the interval printed last spans.
"""

import json
import sys
from datetime import datetime


def main(reference_path: str, resumed_path: str, label: str, failed_at_s: str, first_step_at: str, what: str) -> None:
    with open(reference_path) as f:
        reference = json.load(f)
    with open(resumed_path) as f:
        resumed = json.load(f)
    start = resumed["first_step"]
    print(f"loss by step (reference: 4 ranks uninterrupted; {label}: {resumed['world_size']} ranks from step {start})")
    for step, loss in enumerate(reference["losses"]):
        again = resumed["losses"][step - start] if step >= start else None
        shown = f"{again:.6f}  (diff {again - loss:+.1e})" if again is not None else ""
        print(f"  step {step}: {loss:.6f}  {shown}")
    first = datetime.fromisoformat(first_step_at).timestamp()
    print(f"{what}: {first - float(failed_at_s):.1f} s")


if __name__ == "__main__":
    main(*sys.argv[1:])
