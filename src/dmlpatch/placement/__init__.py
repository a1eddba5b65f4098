"""Where the program's model compute really ran: counted beside the device it was sent to.

Empty on purpose: importing the package costs nothing; each module is imported where used.
"""
