"""Reports: the terminal table and the JSON document."""
