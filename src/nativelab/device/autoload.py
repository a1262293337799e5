"""Entry point of the `torch.backends` group: `import torch` runs `autoload()` (opt out with
TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""


def autoload() -> None:
    import nativelab  # noqa: F401  (registers the device on import)
