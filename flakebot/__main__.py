from flakebot.cli.app import main

main()
