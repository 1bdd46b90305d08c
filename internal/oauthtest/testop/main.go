// Command testop runs oauthtest's authorization server (zitadel/oidc's OP)
// in the foreground, for trying server.oauth by hand (docs/oauth.md): one
// user, one public client "agent" (PKCE) and one confidential client
// "gateway", until interrupted. It is a test tool: never an identity
// provider for anything real.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/confidential-mcp/cmcp/internal/oauthtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9400", "address to listen on")
	email := flag.String("email", "alice@example.com", "the user's email (and login name)")
	password := flag.String("password", "password", "the user's password")
	groups := flag.String("groups", "ops", "the user's groups, comma-separated")
	redirect := flag.String("redirect", "http://127.0.0.1:8976/callback,http://localhost:6274/oauth/callback", "redirect URIs of the public client \"agent\", comma-separated")
	flag.Parse()
	var gs []string
	if *groups != "" {
		gs = strings.Split(*groups, ",")
	}
	s, err := oauthtest.New(oauthtest.Options{
		Addr:  *addr,
		Users: []oauthtest.User{{Subject: "u-" + strings.Split(*email, "@")[0], Email: *email, EmailVerified: true, Password: *password, Groups: gs}},
		Clients: []oauthtest.Client{
			{ID: "agent", RedirectURIs: strings.Split(*redirect, ",")},
			{ID: "gateway", Secret: "gateway-secret"},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testop:", err)
		os.Exit(1)
	}
	defer s.Close()
	fmt.Printf("issuer %s\nuser %s (password %q, groups %v)\nclients: agent (public, PKCE), gateway (secret %q)\n", s.Issuer, *email, *password, gs, "gateway-secret")
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	<-c
}
