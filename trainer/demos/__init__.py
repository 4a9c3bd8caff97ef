"""Ready-to-train LightningModules and DataModules (the `ddp-train` defaults and examples).

Config files name the defining module (`trainer.demos.digits.DigitsClassifier`); the names
are also re-exported here, imported on first use so that `import trainer.demos.text` does
not pay for scikit-learn or torchmetrics.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DigitsDataModule": "trainer.demos.digits",
    "DigitsClassifier": "trainer.demos.digits",
    "SyntheticDataModule": "trainer.demos.synthetic",
    "MLPRegressor": "trainer.demos.synthetic",
    "TextDataModule": "trainer.demos.text",
    "CharGPT": "trainer.demos.char_gpt",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer.demos' has no attribute {name!r}; it exports {__all__}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
