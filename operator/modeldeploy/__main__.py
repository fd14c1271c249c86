"""``python -m modeldeploy``: run the operator."""

from .operator import main

raise SystemExit(main())
