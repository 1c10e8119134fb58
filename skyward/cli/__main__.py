from skyward.cli import main

main(prog_name="skyward")
