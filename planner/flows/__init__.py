"""One module per command: its inputs and one Settings object in, a result object out.

``search``, ``estimate``, ``explain`` (a plan's placement, timeline, traffic and exports),
``profile``, ``run``, ``replan`` and ``tune``. A flow never prints: it returns what it found,
logs with ``logging`` and reports progress through a callback; ``planner.views`` renders. Only
``profile``, ``run`` and ``replan`` reach the profiler or the runtime, and they import torch
inside the functions that need it, so that planning on a laptop stays light.
"""
