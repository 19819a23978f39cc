//! The deployment files in `deploy/` stay consistent with the launcher and rendezvous.

use std::path::PathBuf;

fn deploy(p: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(p);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn kubernetes_manifest_wires_index_to_node_rank() {
    let y = deploy("k8s/sinter-train.yaml");
    for want in [
        "kind: Service",
        "clusterIP: None",
        "kind: Job",
        "completionMode: Indexed",
        "completions: 4",
        "parallelism: 4",
        "subdomain: sinter-train",
        "batch.kubernetes.io/job-completion-index",
        "nvidia.com/gpu: 8",
        "value: sinter-train-0.sinter-train",
        "- $(NODE_RANK)",
        "- --nproc-per-node",
        "- --master-addr",
    ] {
        assert!(y.contains(want), "manifest lacks `{want}`");
    }
    assert!(!y.contains('\t'), "YAML must not contain tabs");
}

#[test]
fn slurm_scripts_parse_and_use_slurm_ids() {
    for (f, wants) in [
        (
            "slurm/sinter-node.sbatch",
            &[
                "--node-rank \"$SLURM_NODEID\"",
                "sinter launch",
                "--kill-on-bad-exit=1",
                "#SBATCH --ntasks-per-node=1",
            ][..],
        ),
        (
            "slurm/sinter-gpu.sbatch",
            &[
                "#SBATCH --ntasks-per-node=8",
                "--kill-on-bad-exit=1",
                "SLURM_JOB_NODELIST",
            ][..],
        ),
    ] {
        let s = deploy(f);
        for w in wants {
            assert!(s.contains(w), "{f} lacks `{w}`");
        }
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy")
            .join(f);
        let st = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success(), "{f} has a bash syntax error");
    }
    assert!(deploy("README.md").contains("Indexed Job"));
}
