"""The execution layer of evolution: how ONE memory program runs and is measured (sandbox,
validation, component diff, the stage-cached runner, diagnostics, ``memgym program eval``,
``memgym eval``). Nothing here imports :mod:`memgym.evolution.search`.
"""
