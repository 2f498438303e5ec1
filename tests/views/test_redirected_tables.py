"""Tables written to a file or pipe keep every row on one line: a search's
ranked plans, redirected, read one plan per line, as grep and people expect."""

import os
import re
import subprocess
import sys


def test_a_redirected_search_table_keeps_each_plan_on_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    args = ["search", "-m", "llama3-8b", "-c", "dgx-h100:2", "--global-batch-size", "256", "--seq-len", "4096"]
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args, "--top-k", "3"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3, proc.stdout  # one line per plan: nothing wrapped
    assert all(re.search(r"\bdp\d+ tp\d+ pp\d+ .* rc-", row) for row in rows)  # each a whole layout
