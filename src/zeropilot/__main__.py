from zeropilot.cli import main

raise SystemExit(main())
