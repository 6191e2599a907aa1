"""The job as users write and inspect it: the spec, YAML loading and ``--set``, the
fingerprint of what results depend on, task handlers, ``status`` and ``export``.

The earliest stage: it imports only ``io``, ``engines`` and ``capacity``."""
