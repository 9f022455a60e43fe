//! `redrive-executor`: [`redrive_executor::main_with_args`] with this
//! process's arguments.

fn main() -> std::process::ExitCode {
    redrive_executor::main_with_args(std::env::args_os())
}
