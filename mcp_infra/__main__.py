from mcp_infra.faces.cli import main

raise SystemExit(main())
