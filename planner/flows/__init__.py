"""One module per command: its inputs and one Settings object in, a result object out.

``search``, ``estimate``, ``explain`` (a plan's placement, timeline, traffic and exports),
``profile``, ``run``, ``replan`` and ``tune``. A flow never prints: it returns what it found,
logs with ``logging`` and reports progress through a callback; ``planner.views`` renders. Only
``profile``, ``run`` and ``replan`` (from a checkpoint) reach the profiler or the runtime, and they
import torch inside the functions that need it, so that planning needs no torch at all (it is the
``planner[runtime]`` extra). Those functions, and a tune that runs its trials here, call
``extras.require_torch`` first: a missing torch is one line naming the extra.
"""
