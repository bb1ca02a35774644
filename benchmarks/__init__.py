"""Benchmarks of ahmc against NUTS: models, data, metrics and the runner.

    ./dev run python -m benchmarks.run [--full] [--models a,b] [--samplers x,y]

See ``benchmarks/run.py`` for the command line, ``benchmarks/models.py`` for
the models and ``benchmarks/metrics.py`` for what is measured.
"""
