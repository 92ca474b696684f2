"""The optional features' packages: Dask (`executor=dask:…`), s3fs (`cache=s3://…`),
gguf, safetensors and ml-dtypes (the checkpoint importers) come with the package's extras, not
with a plain `pip install`. A feature asked for without its extra is one line that names it."""

import importlib.util

DIST = "logos-sambaflow-emitter"


def require(module, extra, feature, error=ImportError):
    """Raise `error("FEATURE needs the [EXTRA] extra: pip install '…[EXTRA]' …")` when `module`
    is not installed. Only looked up, not imported (a probe stays cheap); the caller imports it."""
    if importlib.util.find_spec(module) is None:
        raise error(f"{feature} needs the [{extra}] extra: pip install '{DIST}[{extra}]' "
                    f"({module} is not installed)")
