"""Every table and plot a person reads: ``tables`` (rich tables of plans, estimates, searches,
runs and re-plans), ``plots`` (a plan's schedule, memory and step time; a search's landscape),
``tune_tables`` and ``tune_plot`` (a tune's trials and the model's errors). Views take result
objects and return renderables or write image files; they compute nothing the flows did not."""
