//! Compiles `redrive/v1/*.proto` with protox (no protoc on the machine) and writes
//! the descriptor set for server reflection next to the generated code.

use std::{env, error::Error, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "redrive/v1/messages.proto",
    "redrive/v1/planner.proto",
    "redrive/v1/coordinator.proto",
    "redrive/v1/state_check.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("redrive_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    // Type names: the codec looks each request up by its full name for the
    // wire check (`src/codec.rs`).
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Deterministic encoding: the capture fingerprint hashes encoded headers.
        .btree_map(".")
        .codec_path("crate::codec::CheckedCodec")
        .compile_fds_with_config(descriptors, config)?;
    Ok(())
}
