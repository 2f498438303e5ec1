"""Reading and writing the planner's files; nothing here searches or prices.

- ``models``: a model preset, a Hugging Face ``config.json`` (``hf_config``: other families'
  spellings of its keys) or our YAML → ``ModelSpec``.
- ``clusters``: a preset ``NAME:NODES``, presets mixed with ``+`` (``cluster_mix``) or a profile
  JSON → ``ClusterProfile``, and a profile written back; ``cluster_presets``: a preset's published
  figures → ``ClusterProfile``.
- ``plans``: plan files (versioned, upgraded on read); ``routing_trace``: an MoE run's routing.
- ``reading``: text, JSON and YAML, and pydantic's errors as one ``SchemaError`` line.
"""
