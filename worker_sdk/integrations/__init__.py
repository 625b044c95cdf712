"""rvsup for training loops a framework owns: one callback, nothing else (docs/integrations.md).

- :mod:`.transformers`: Hugging Face ``transformers.Trainer`` (``RvsupCallback``)
- :mod:`.lightning`: Lightning's ``Trainer`` (``lightning`` or ``pytorch_lightning``)

Both keep the framework's own checkpoints and mark them durable with rvsup
(``worker_sdk.resume(external=True)``, ``worker_sdk.checkpointed``): rvsup decides when one is
due, validates it (a checkpoint no marker names is never resumed) and restarts from it. The
daemon never imports this package.
"""
