from tests.harness.cli import main

raise SystemExit(main())
