"""The ground floor every layer shares, importing nothing else of epochstream but
:mod:`epochstream.exceptions`: the contracts of user code that the API builds and the
runtime runs (function base classes in :mod:`.functions`, time domains and durations in
:mod:`.time`, watermark strategies and generators in :mod:`.watermarks`, as Flink keeps
them in flink-core), clocks (:mod:`.clock`), stream events such as checkpoint options
(:mod:`.events`), storage filesystems, local and S3 (:mod:`.filesystems`), with
their fault classification (:mod:`.storage_faults`) and private local files
(:mod:`.private_files`), restart strategies (:mod:`.restart`), and the Arrow helpers
of columnar batches (:mod:`.arrow`).

The layers above (docs/architecture.md, *Layers*) import from here; the contracts in
``pyproject.toml`` (``[tool.importlinter]``) keep it that way.

Example::

    from epochstream.core.clock import ManualClock
    clock = ManualClock(0.0); clock.advance(1.5)
"""
