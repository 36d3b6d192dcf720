import sys

from torch_tensorrt_dist.cli import main

sys.exit(main())
