package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
)

// CheckFiles reads the files that `cmcp serve` reads at start besides the
// configuration: each HTTP upstream's ca_file (PEM certificates),
// bearer_token_file and headers_from_file (one non-empty line each), and
// server.tls's cert, key and client_ca. Load does not read them (they are
// secrets, and SIGHUP re-reads the credential files itself); serve checks
// them before it opens the audit log, and spawn-digest --check too. Each
// problem is an *Error at the setting's line; one about a file that could
// not be opened or read wraps the cause (errors.Is fs.ErrNotExist or
// fs.ErrPermission), which --check only warns about.
func (c *Config) CheckFiles() error {
	var errs Errors
	add := func(e *Error) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		h := u.HTTP
		if h == nil {
			continue
		}
		f := fmt.Sprintf("upstreams[%d] (%s).http", i, u.Name)
		at := func(keys ...any) valuePath { return append(valuePath{"upstreams", i, "http"}, keys...) }
		if h.CAFile != "" {
			add(c.checkPEM(at("ca_file"), f+".ca_file", h.CAFile))
		}
		if h.BearerTokenFile != "" {
			add(c.checkCredential(at("bearer_token_file"), f+".bearer_token_file", h.BearerTokenFile))
		}
		for _, name := range slices.Sorted(maps.Keys(h.HeadersFromFile)) {
			add(c.checkCredential(at("headers_from_file", name), f+".headers_from_file."+name, h.HeadersFromFile[name]))
		}
	}
	if s := c.Server; s != nil && s.TLS != nil {
		t := s.TLS
		cert, key := c.Resolve(t.Cert), c.Resolve(t.Key)
		certErr := c.checkReadable(valueAt("server", "tls", "cert"), "server.tls.cert", cert)
		keyErr := c.checkReadable(valueAt("server", "tls", "key"), "server.tls.key", key)
		add(certErr)
		add(keyErr)
		if certErr == nil && keyErr == nil {
			if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
				add(c.errorAt(valueAt("server", "tls", "cert"), "server.tls", "cert must be a PEM certificate chain and key its PEM private key",
					"%s and %s: %v", cert, key, err))
			}
		}
		if t.ClientCA != "" {
			add(c.checkPEM(valueAt("server", "tls", "client_ca"), "server.tls.client_ca", c.Resolve(t.ClientCA)))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// CheckEnv looks up, with lookup, the environment variables that HTTP
// upstreams take credentials from (bearer_token_env, headers_from_env),
// which serve reads at start. Each one unset or empty is an *Error at its
// setting's line; where names the environment ("the gateway's
// environment"). Load cannot check them: SIGHUP and spawn-digest --check
// may run in another environment than serve.
func (c *Config) CheckEnv(lookup func(string) (string, bool), where string) error {
	var errs Errors
	check := func(path valuePath, field, name, instead string) {
		if v, ok := lookup(name); !ok || v == "" {
			errs = append(errs, c.errorAt(path, field, fmt.Sprintf("set %s in the environment cmcp serve runs in, or use %s", name, instead),
				"%s is not set (or is empty) in %s", name, where))
		}
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		h := u.HTTP
		if h == nil {
			continue
		}
		f := fmt.Sprintf("upstreams[%d] (%s).http", i, u.Name)
		if h.BearerTokenEnv != "" {
			check(valueAt("upstreams", i, "http", "bearer_token_env"), f+".bearer_token_env", h.BearerTokenEnv, "bearer_token_file")
		}
		for _, name := range slices.Sorted(maps.Keys(h.HeadersFromEnv)) {
			check(valueAt("upstreams", i, "http", "headers_from_env", name), f+".headers_from_env."+name, h.HeadersFromEnv[name], "headers_from_file")
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// errorAt is an error about the value at path (from the top of the file),
// at its line and column.
func (c *Config) errorAt(path valuePath, field, hint, format string, args ...any) *Error {
	file := c.name
	if file == "" {
		file = c.Path
	}
	e := &Error{File: file, Field: field, Msg: fmt.Sprintf(format, args...), Hint: hint}
	if n := nodeAt(c.root, path, nil); n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// checkReadable reports a file that cannot be read, with what to do.
func (c *Config) checkReadable(path valuePath, field, file string) *Error {
	f, err := os.Open(file)
	if err == nil {
		f.Close()
		return nil
	}
	return c.fileError(path, field, err)
}

func (c *Config) fileError(path valuePath, field string, err error) *Error {
	hint := ""
	switch {
	case errors.Is(err, fs.ErrNotExist):
		hint = "create the file, or correct the path (a relative path is relative to the configuration file)"
	case errors.Is(err, fs.ErrPermission):
		hint = "make the file readable to the user cmcp runs as"
	}
	e := c.errorAt(path, field, hint, "%v", err)
	e.err = err
	return e
}

// checkPEM reports a file that does not hold a PEM certificate.
func (c *Config) checkPEM(path valuePath, field, file string) *Error {
	b, err := os.ReadFile(file)
	if err != nil {
		return c.fileError(path, field, err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return c.errorAt(path, field, "give a file of PEM certificates (-----BEGIN CERTIFICATE-----)", "%s holds no PEM certificate", file)
	}
	return nil
}

// checkCredential reports a credential file that serve could not use: one
// it cannot read, or that holds no credential or more than one line (its
// trailing line break is dropped, as serve drops it).
func (c *Config) checkCredential(path valuePath, field, file string) *Error {
	b, err := os.ReadFile(file)
	if err != nil {
		return c.fileError(path, field, err)
	}
	switch _, err := Credential(b); {
	case errors.Is(err, ErrCredentialEmpty):
		return c.errorAt(path, field, fmt.Sprintf("write the credential into %s, on one line", file), "%s is empty", file)
	case err != nil:
		return c.errorAt(path, field, fmt.Sprintf("keep only the credential in %s, on one line", file), "%s holds more than one line", file)
	}
	return nil
}

// Errors of Credential.
var (
	ErrCredentialEmpty     = errors.New("is empty")
	ErrCredentialMultiLine = errors.New("holds more than one line")
)

// Credential is the credential a credential file holds (bearer_token_file,
// headers_from_file): its content without the trailing line break, which
// must be neither empty nor more than one line. Serve reads credential
// files with it, and CheckFiles checks them with it.
func Credential(b []byte) (string, error) {
	v := strings.TrimRight(string(b), "\r\n")
	switch {
	case v == "":
		return "", ErrCredentialEmpty
	case strings.ContainsAny(v, "\r\n"):
		return "", ErrCredentialMultiLine
	}
	return v, nil
}

// CheckCommands finds each stdio upstream's command with find (as its
// spawn will: a path, or a name on the PATH of the child's environment)
// and returns an *Error at the command's line for each that cannot be
// found, all at once: serve checks them before it opens the audit log, as
// it does the files of CheckFiles, so that a start with a command that is
// not there is refused at start instead of every call failing later.
func (c *Config) CheckCommands(find func(u *Upstream) error) error {
	var errs Errors
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		if u.Stdio == nil {
			continue
		}
		if err := find(u); err != nil {
			errs = append(errs, c.errorAt(valueAt("upstreams", i, "stdio", "command"), fmt.Sprintf("upstreams[%d] (%s).stdio.command", i, u.Name),
				"install the server, or give its absolute path; a name is looked up on the PATH of the child's environment (stdio.env, or the gateway's PATH)",
				"%v", err))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}
