"""One line for every way a `ddp-train` config can be wrong.

Hydra and OmegaConf report bad overrides as multi-line messages with search paths and
object types; a user needs the key, the value and the choices. `describe_error` extracts
those from the exception's attributes (not by parsing its text where it can avoid it);
`ConfigError` is the CLI's own such line, raised by its checks and its constructors' wrapper.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import InstantiationException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from trainer.cli.schemas import config_dir

SCHEMA_PREFIX = "base_"  # ConfigStore schemas (trainer/cli/schemas.py) are not choices a user makes


class ConfigError(ValueError):
    """A composed config holds a value the job can't run with; the message is one line
    naming the key, the value and what is allowed (or, with `value` omitted, what went wrong)."""

    _NO_VALUE: Any = object()

    def __init__(self, key: str, value: Any = _NO_VALUE, expected: str = "", joined: str = ": ") -> None:
        self.key, self.value, self.expected = key, value, expected
        text = f"{key}={value!r} {expected}" if value is not self._NO_VALUE else f"{key}{joined}{expected}"
        super().__init__(" ".join(line.strip() for line in text.splitlines()))  # always one line


def constructor_error(group: str, error: Exception) -> ConfigError:
    """A constructor's (or a check's) error as a one-line ConfigError: a message opening with
    `name=value` names the key `group.name` (`name` for a top-level key, group ""); any other is
    prefixed with `group: `."""
    message = str(error).rstrip(".")
    named = re.match(r"^(\w+)=", message)
    if named is None:
        return ConfigError(group, expected=message)
    key = f"{group}.{named.group(1)}" if group else named.group(1)
    return ConfigError(key, expected=message[named.end(1):], joined="")


def describe_error(error: BaseException) -> str:
    """A one-line description of a config problem, naming the key and what is allowed."""
    cause = error.__cause__
    if isinstance(error, MissingConfigException):
        text = _missing_config(error)
    elif isinstance(error, OverrideParseException):
        text = f"cannot parse override {error.override!r}: {_first_line(error.message)}"
    elif isinstance(error, InstantiationException):
        text = _instantiation(error)
    elif isinstance(cause, OmegaConfBaseException):  # ConfigCompositionException around it
        text = _omegaconf(cause)
    elif isinstance(error, OmegaConfBaseException):
        text = _omegaconf(error)
    else:
        text = str(error)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _missing_config(error: MissingConfigException) -> str:
    """`model=nosuchmodel` -> "model='nosuchmodel' is not one of ['digits_cnn', ...]"."""
    missing = error.missing_cfg_file or ""
    group, _, choice = missing.rpartition("/")
    if not group:
        return f"config {missing!r} was not found; is --config-name/--config-dir right?"
    options = [o for o in (error.options or _group_options(group)) if not o.startswith(SCHEMA_PREFIX)]
    return f"{group.replace('/', '.')}={choice!r} is not one of {options}"


def _group_options(group: str) -> list[str]:
    """The choices Hydra sees for `group` (Hydra leaves them out of some errors). Hydra has
    torn down its state when the error reaches us, so look in the package's `conf/` again."""
    try:
        if GlobalHydra.instance().is_initialized():
            return sorted(GlobalHydra.instance().config_loader().get_group_options(group))
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            return sorted(GlobalHydra.instance().config_loader().get_group_options(group))
    except Exception:  # the message still names the key and the value
        return []


def _omegaconf(error: OmegaConfBaseException) -> str:
    key = error.full_key or str(error.key or "")
    if isinstance(error, (ConfigAttributeError, ConfigKeyError)) and "not in" in str(error.msg):
        known = _known_keys(error)
        listing = f"; known keys{' of ' + key.rpartition('.')[0] if '.' in key else ''}: {known}" if known else ""
        return f"{key} is not a known key{listing} (to add a new key, use +{key}=...)"
    if isinstance(error, ValidationError):
        expected = re.search(r"converted to (\w+)", str(error.msg))
        detail = f"is not a valid {expected.group(1).lower()}" if expected else _first_line(str(error.msg))
        return f"{key}={error.value!r} {detail}"
    return f"{key}: {_first_line(str(error.msg))}" if key else _first_line(str(error))


def _known_keys(error: OmegaConfBaseException) -> list[str]:
    schema = error.object_type
    if schema is not None and dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    parent = error.parent_node
    if isinstance(parent, DictConfig):
        return sorted(str(k) for k in parent.keys() if k != "hydra")
    return []


def _instantiation(error: InstantiationException) -> str:
    """Hydra's "Error in call to target 'X': ValueError(...)" -> "X: <the constructor's message>"."""
    cause = error.__cause__
    target = re.search(r"target '([^']+)'", str(error))
    name = target.group(1) if target else "_target_"
    if isinstance(cause, ImportError) or str(error).startswith("Error locating target"):
        reason = _first_line(str(cause).split(":", 1)[-1]) if cause else "not importable"
        return f"_target_={name!r} cannot be imported ({reason.strip()})"
    return f"{name}: {_first_line(str(cause) if cause else str(error))}"


def _first_line(text: Any) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""
