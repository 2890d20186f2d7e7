from txsink.ops.cli import main

raise SystemExit(main())
