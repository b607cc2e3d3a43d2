"""The torchvision import fix lives in sjd.torchvision_compat. Virtual environments made before it
moved there name this module in their start-up .pth file (see the Makefile), so it stays importable."""

from sjd.torchvision_compat import import_torchvision, install_torchvision_import_fix  # noqa: F401
