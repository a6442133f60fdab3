//! A std-only HTTP/1.0 service skeleton: flakebot's starting point for `craft --service`.
//!
//! Listens on 127.0.0.1:$PORT (default 8080); GET /health answers 200 once it listens. Keep every piece of
//! state under $STATE_DIRECTORY (write a temporary file and rename it, so a kill never leaves half a value).
//! SIGTERM (or SIGINT): stops accepting and exits 0. Add the service's routes in `route`.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);
const SIGTERM: i32 = 15;
const SIGINT: i32 = 2;
const MAX_BODY: usize = 64 * 1024;

extern "C" {
    // libc's signal(): std links libc already, so no crate is needed for one flag-setting handler.
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
}

extern "C" fn on_stop(_signum: i32) {
    STOP.store(true, Ordering::SeqCst); // async-signal-safe: an atomic store only
}

/// One request: its method, path and body.
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}: an HTTP service\n\nEnvironment:\n  PORT             port on 127.0.0.1 (default 8080)\n  STATE_DIRECTORY  where its state is kept", env!("CARGO_PKG_NAME"));
        return;
    }
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(8080);
    let state = PathBuf::from(std::env::var("STATE_DIRECTORY").unwrap_or_else(|_| ".".into()));
    unsafe {
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
    }
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
        eprintln!("cannot listen on 127.0.0.1:{port}: {e}");
        std::process::exit(1);
    });
    listener.set_nonblocking(true).expect("nonblocking listener");
    eprintln!("listening on 127.0.0.1:{port}, state in {}", state.display());
    while !STOP.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = serve(stream, &state) {
                    eprintln!("request failed: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => eprintln!("accept: {e}"),
        }
    }
    eprintln!("stopping (signal)");
}

/// The answer to one request: (status, body).
fn route(request: &Request, _state: &Path) -> (u16, Vec<u8>) {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => (200, b"ok\n".to_vec()),
        _ => (404, b"not found\n".to_vec()),
    }
}

fn serve(mut stream: TcpStream, state: &Path) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 * 1024 {
            return reply(&mut stream, 431, b"request head too large\n");
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or("").to_string());
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return reply(&mut stream, 413, b"body too large\n");
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    let (status, answer) = route(&Request { method, path, body }, state);
    reply(&mut stream, status, &answer)
}

fn reply(stream: &mut TcpStream, status: u16, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.0 {status} {reason}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
