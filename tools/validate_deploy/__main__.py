import sys

from tools.validate_deploy.cli import main

sys.exit(main())
