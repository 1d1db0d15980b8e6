"""What people see: the phase palette and vocabulary, the terminal table and TUI."""
