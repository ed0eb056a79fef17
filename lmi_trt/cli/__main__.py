import sys

from lmi_trt.cli import main

sys.exit(main())
