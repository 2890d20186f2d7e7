from txsink.cli import main

raise SystemExit(main())
