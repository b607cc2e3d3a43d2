# torchmetrics and transformers import torchvision whenever it is installed, and PyPI's torchvision
# fails to import on the CPU torch; the hook fixes that import and costs nothing until it happens.
from sjd.eval.torchvision_compat import install_torchvision_import_fix

install_torchvision_import_fix()
