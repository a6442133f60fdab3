//! A std-only HTTP/1.0 service skeleton: flakebot's starting point for `craft --service`.
//!
//! Listens on $LISTEN_ADDRESS:$PORT (default 127.0.0.1:8080; an OCI image sets 0.0.0.0, the address of its own
//! network namespace a container engine publishes); GET /health answers 200 once it listens. Keep every piece of
//! state under $STATE_DIRECTORY (write a temporary file and rename it, so a kill never leaves half a value).
//! SIGTERM (or SIGINT): stops accepting and exits 0. Add the service's routes in `route`: each returns a
//! `Response` (status and body, plus any header: `Response::new(302, "").header("Location", "/there")`).

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

/// One request: its method, path, headers (name, value) and body.
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (any case), if the request carries it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One answer: its status, its headers (Content-Length and Connection are added when it is sent; Content-Type is
/// application/octet-stream unless set here) and its body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: Vec::new(), body: body.into() }
    }

    /// The same answer with one more header, e.g. `.header("Content-Type", "application/json")`.
    pub fn header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}: an HTTP service\n\nEnvironment:\n  PORT             port to listen on (default 8080)\n  LISTEN_ADDRESS   address to listen on (default 127.0.0.1)\n  STATE_DIRECTORY  where its state is kept", env!("CARGO_PKG_NAME"));
        return;
    }
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(8080);
    let state = PathBuf::from(std::env::var("STATE_DIRECTORY").unwrap_or_else(|_| ".".into()));
    unsafe {
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
    }
    let address = listen_address();
    let listener = TcpListener::bind((address, port)).unwrap_or_else(|e| {
        eprintln!("cannot listen on {address}:{port}: {e}");
        std::process::exit(1);
    });
    listener.set_nonblocking(true).expect("nonblocking listener");
    eprintln!("listening on {address}:{port}, state in {}", state.display());
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

/// $LISTEN_ADDRESS, or 127.0.0.1 when unset; one that is not an IP address ends the start (never a silent default).
fn listen_address() -> std::net::IpAddr {
    match std::env::var("LISTEN_ADDRESS") {
        Err(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        Ok(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("LISTEN_ADDRESS {text:?} is not an IP address");
            std::process::exit(1);
        }),
    }
}

/// The answer to one request.
fn route(request: &Request, _state: &Path) -> Response {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => Response::new(200, "ok\n"),
        _ => Response::new(404, "not found\n"),
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
            return reply(&mut stream, Response::new(431, "request head too large\n"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or("").to_string());
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return reply(&mut stream, Response::new(413, "body too large\n"));
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
    let answer = route(&Request { method, path, headers, body }, state);
    reply(&mut stream, answer)
}

fn reply(stream: &mut TcpStream, answer: Response) -> std::io::Result<()> {
    let reason = match answer.status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.0 {} {reason}\r\nContent-Length: {}\r\n", answer.status, answer.body.len());
    if !answer.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
        head.push_str("Content-Type: application/octet-stream\r\n");
    }
    for (name, value) in &answer.headers {
        // a CR or LF would end the header early and let the rest be read as another; the length and the close
        // are this function's own
        let own = name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("connection");
        if !own && !name.contains(['\r', '\n', ':']) && !value.contains(['\r', '\n']) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(&answer.body)?;
    stream.flush()
}
