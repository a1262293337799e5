"""Lab 2 entry point, with the guide's flags: python labs/lab2/run.py --model base --compile --greedy"""

from nativelab.apps.run import main

if __name__ == "__main__":
    main()
