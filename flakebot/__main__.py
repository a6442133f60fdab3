from flakebot.cli import main

main()
