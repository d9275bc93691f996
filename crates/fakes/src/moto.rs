//! Runs `moto_server` (moto from PyPI, installed by `scripts/setup.sh` into `target/venv`) on a free
//! loopback port with IAM authentication on: the first three requests (our setup: create a user, its
//! access key and an allow-all policy) are free, every later request must be SigV4-signed with a
//! key moto knows. Instances are created with boto3 from the same virtualenv.
//!
//! A missing virtualenv makes [`Moto::start`] panic with a message naming the setup step: tests never
//! skip silently.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tributary_testkit::{free_port, listening, wait_ready};

/// The virtualenv: `$TRIBUTARY_VENV`, else `<workspace>/target/venv`.
pub fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("TRIBUTARY_VENV") {
        return PathBuf::from(v);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/venv")
}

/// A running moto_server, killed on drop.
pub struct Moto {
    child: Option<Child>,
    port: u16,
    /// An access key moto knows, allowed everything.
    pub access_key_id: String,
    /// Its secret.
    pub secret_access_key: String,
    /// The subnet (127.0.0.0/24) instances are started in.
    pub subnet_id: String,
    log: tempfile::NamedTempFile,
}

const SETUP: &str = r#"
import json, sys, boto3
a = json.load(sys.stdin)
ep = a["endpoint"]
iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="tributary-test")
k = iam.create_access_key(UserName="tributary-test")["AccessKey"]
iam.put_user_policy(UserName="tributary-test", PolicyName="all",
    PolicyDocument=json.dumps({"Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
ec2 = boto3.client("ec2", endpoint_url=ep, region_name=a["region"],
                   aws_access_key_id=k["AccessKeyId"], aws_secret_access_key=k["SecretAccessKey"])
vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
sub = ec2.create_subnet(VpcId=vpc, CidrBlock="127.0.0.0/24")["Subnet"]["SubnetId"]
print(json.dumps({"key": k["AccessKeyId"], "secret": k["SecretAccessKey"], "subnet": sub}))
"#;

const EC2: &str = r#"
import json, sys, boto3
a = json.load(sys.stdin)
ec2 = boto3.client("ec2", endpoint_url=a["endpoint"], region_name=a["region"],
                   aws_access_key_id=a["key"], aws_secret_access_key=a["secret"])
op = a["op"]
out = {}
if op == "run":
    kw = dict(ImageId="ami-12c6146b", MinCount=a["count"], MaxCount=a["count"],
              TagSpecifications=[{"ResourceType": "instance",
                                  "Tags": [{"Key": k, "Value": v} for k, v in a["tags"].items()]}])
    if not a.get("default_subnet"):
        kw["SubnetId"] = a["subnet"]
    if a.get("private_ip"):
        kw["PrivateIpAddress"] = a["private_ip"]
    r = ec2.run_instances(**kw)
    out["ids"] = [i["InstanceId"] for i in r["Instances"]]
elif op == "terminate":
    ec2.terminate_instances(InstanceIds=a["ids"])
elif op == "stop":
    ec2.stop_instances(InstanceIds=a["ids"])
elif op == "start":
    ec2.start_instances(InstanceIds=a["ids"])
elif op == "tag":
    ec2.create_tags(Resources=a["ids"], Tags=[{"Key": k, "Value": v} for k, v in a["tags"].items()])
elif op == "describe":
    r = ec2.describe_instances(InstanceIds=a["ids"])
    out["instances"] = [{"id": i["InstanceId"], "state": i["State"]["Name"],
                         "private": i.get("PrivateIpAddress"), "public": i.get("PublicIpAddress")}
                        for res in r["Reservations"] for i in res["Instances"]]
print(json.dumps(out))
"#;

/// The region the tests use.
pub const REGION: &str = "us-east-1";

impl Moto {
    /// Starts moto_server and creates the test user, key, VPC and subnet.
    ///
    /// # Panics
    /// When the virtualenv or moto is missing (run `scripts/setup.sh`), or moto does not start.
    pub fn start() -> Moto {
        let venv = venv();
        let server = venv.join("bin/moto_server");
        assert!(
            server.is_file(),
            "{} is missing: run scripts/setup.sh (it installs moto[server] with pip into {})",
            server.display(),
            venv.display()
        );
        let port = free_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "3")
            .env("AWS_DEFAULT_REGION", REGION)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.reopen().unwrap()))
            .stderr(Stdio::from(log.reopen().unwrap()))
            .spawn()
            .expect("spawn moto_server");
        let mut m = Moto {
            child: Some(child),
            port,
            access_key_id: String::new(),
            secret_access_key: String::new(),
            subnet_id: String::new(),
            log,
        };
        let child = m.child.as_mut().expect("just spawned");
        if let Err(why) = wait_ready(child, Duration::from_secs(60), || listening(port)) {
            panic!("moto_server on {port} {why}: {}", m.log_text());
        }
        let out = m.python(SETUP, json!({"endpoint": m.endpoint(), "region": REGION}));
        m.access_key_id = out["key"].as_str().unwrap().to_string();
        m.secret_access_key = out["secret"].as_str().unwrap().to_string();
        m.subnet_id = out["subnet"].as_str().unwrap().to_string();
        m
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// moto_server's output so far (its request log).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    fn python(&self, script: &str, args: Value) -> Value {
        let py = venv().join("bin/python");
        let mut child = Command::new(&py)
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", py.display()));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(args.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "boto3 script failed: {}\nmoto log: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        serde_json::from_slice(&out.stdout).expect("script output is JSON")
    }

    fn ec2(&self, op: &str, mut args: Value) -> Value {
        args["op"] = json!(op);
        args["endpoint"] = json!(self.endpoint());
        args["region"] = json!(REGION);
        args["key"] = json!(self.access_key_id);
        args["secret"] = json!(self.secret_access_key);
        args["subnet"] = json!(self.subnet_id);
        self.python(EC2, args)
    }

    /// Starts `count` instances with `tags` (and `private_ip` when given; then `count` must be 1).
    /// Returns their ids.
    pub fn run_instances(
        &self,
        count: usize,
        tags: &[(&str, &str)],
        private_ip: Option<&str>,
    ) -> Vec<String> {
        self.run(count, tags, "private_ip", json!(private_ip))
    }

    /// Starts `count` instances with `tags` in the default VPC (which gives them public
    /// addresses). Returns their ids.
    pub fn run_public_instances(&self, count: usize, tags: &[(&str, &str)]) -> Vec<String> {
        self.run(count, tags, "default_subnet", json!(true))
    }

    /// The helper's `run` command with one placement option; returns the new instance ids.
    fn run(&self, count: usize, tags: &[(&str, &str)], option: &str, value: Value) -> Vec<String> {
        let tags: serde_json::Map<String, Value> = tags
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut args = json!({"count": count, "tags": tags});
        args[option] = value;
        let out = self.ec2("run", args);
        out["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    pub fn terminate(&self, ids: &[&str]) {
        self.ec2("terminate", json!({ "ids": ids }));
    }

    pub fn stop_instances(&self, ids: &[&str]) {
        self.ec2("stop", json!({ "ids": ids }));
    }

    pub fn tag(&self, ids: &[&str], tags: &[(&str, &str)]) {
        let tags: serde_json::Map<String, Value> = tags
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.ec2("tag", json!({"ids": ids, "tags": tags}));
    }

    /// `[{id, state, private, public}]` as boto3 sees them.
    pub fn describe(&self, ids: &[&str]) -> Vec<Value> {
        self.ec2("describe", json!({ "ids": ids }))["instances"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Kills moto (the registry is down).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.kill();
    }
}
