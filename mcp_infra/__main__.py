from mcp_infra.cli import main

raise SystemExit(main())
