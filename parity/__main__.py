from parity.cli import main

main()
