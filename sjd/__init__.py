# torchmetrics and transformers import torchvision whenever it is installed, and PyPI's torchvision
# fails to import on the CPU torch; the hook fixes that import and costs nothing until it happens.
# sjd.torchvision_compat imports only the standard library, so importing any part of sjd stays light.
from sjd.torchvision_compat import install_torchvision_import_fix

install_torchvision_import_fix()
