package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// codeEnv are environment variables whose value makes a program load or
// run code it names: code outside the pinned command and target, which the
// gateway would record as measured. Each says why.
var codeEnv = map[string]string{
	"GCONV_PATH":           "glibc loads character-set conversion modules (shared libraries) from the directories it lists",
	"BASH_ENV":             "bash runs the file it names before every non-interactive script",
	"ENV":                  "sh and bash in POSIX mode run the file it names at start",
	"SHELLOPTS":            "bash takes shell options from it (xtrace runs the command substitutions in PS4)",
	"BASHOPTS":             "bash takes shell options from it",
	"PS4":                  "bash runs its command substitutions for every traced command",
	"NODE_OPTIONS":         "node takes options from it (--require and --import load modules before the server's own)",
	"NODE_PATH":            "node resolves modules from the directories it lists",
	"PYTHONPATH":           "python imports modules from the directories it lists before its own (a sitecustomize.py there runs in every python process)",
	"PYTHONHOME":           "python takes its standard library, site.py included, from it",
	"PYTHONSTARTUP":        "python runs the file it names in interactive mode",
	"PYTHONINSPECT":        "python reads code from standard input after the script ends, where the gateway writes agents' messages",
	"PYTHONUSERBASE":       "python runs usercustomize.py and the .pth files of the site-packages under it",
	"PYTHONPYCACHEPREFIX":  "python runs the bytecode (.pyc) it finds under the directory it names instead of compiling the modules it imports, and no pin covers that directory (to keep bytecode out of a pinned tree, set PYTHONDONTWRITEBYTECODE=1 instead)",
	"PYTHONBREAKPOINT":     "python imports and calls the function it names at breakpoint()",
	"PYTHONWARNINGS":       "python imports the module of a warning category it names",
	"PERL5LIB":             "perl loads modules from the directories it lists before its own",
	"PERLLIB":              "perl loads modules from the directories it lists before its own",
	"PERL5OPT":             "perl takes options from it (-M loads a module)",
	"PERL5DB":              "perl runs it as the debugger's code",
	"RUBYOPT":              "ruby takes options from it (-r loads a library)",
	"RUBYLIB":              "ruby loads libraries from the directories it lists before its own",
	"GEM_HOME":             "ruby loads gems from it",
	"GEM_PATH":             "ruby loads gems from the directories it lists",
	"BUNDLE_GEMFILE":       "bundler runs the Gemfile it names (Ruby code)",
	"JAVA_TOOL_OPTIONS":    "the JVM takes options from it (-javaagent loads code)",
	"_JAVA_OPTIONS":        "the JVM takes options from it (-javaagent loads code)",
	"JDK_JAVA_OPTIONS":     "the java launcher takes options from it (-javaagent loads code)",
	"CLASSPATH":            "java loads classes from it",
	"DOTNET_STARTUP_HOOKS": ".NET runs the assemblies it names at start",
	"PHPRC":                "php reads its ini file from it (auto_prepend_file runs code)",
	"PHP_INI_SCAN_DIR":     "php reads ini files from it (auto_prepend_file runs code)",
	"OPENSSL_CONF":         "OpenSSL loads the engines and providers (shared libraries) it configures",
	"OPENSSL_ENGINES":      "OpenSSL loads engines (shared libraries) from it",
	"OPENSSL_MODULES":      "OpenSSL loads providers (shared libraries) from it",
}

// codeEnvPrefixes are families of code-loading variables, matched by
// prefix (npm's case-insensitively, as npm reads them).
var codeEnvPrefixes = []struct{ prefix, why string }{
	{"LD_", "the dynamic loader loads the libraries it names into the program (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT), and LD_* variables steer it"},
	{"DYLD_", "the dynamic loader loads the libraries it names into the program"},
	{"LUA_PATH", "lua loads modules from the paths it lists"},
	{"LUA_CPATH", "lua loads C modules (shared libraries) from the paths it lists"},
	{"LUA_INIT", "lua runs it, or the file it names, at start"},
	{"CORECLR_PROFILER_PATH", ".NET loads the profiler library it names"}, // and _32, _64, _ARM64
	{"npm_config_", "npm and npx take settings from it (the registry packages come from, node options, the shell scripts run in)"},
}

// CodeLoadingEnv reports why the environment variable name makes a program
// load or run code named by its value (code a pin does not cover), or ""
// when it does not. The gateway refuses such a variable in a stdio
// upstream's env and env_allow unless the upstream sets allow_code_env,
// and then records the upstream's spawns as spawn-unmeasured.
func CodeLoadingEnv(name string) string {
	if why, ok := codeEnv[name]; ok {
		return why
	}
	for _, p := range codeEnvPrefixes {
		if strings.HasPrefix(name, p.prefix) || p.prefix == "npm_config_" && len(name) >= len(p.prefix) && strings.EqualFold(name[:len(p.prefix)], p.prefix) {
			return p.why
		}
	}
	return ""
}

// credentialEnv maps each environment variable that holds an HTTP
// upstream's credential (bearer_token_env, headers_from_env) to the setting
// that names it.
func credentialEnv(c *Config) map[string]string {
	out := map[string]string{}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		if u.HTTP == nil {
			continue
		}
		f := fmt.Sprintf("upstreams[%d] (%s).http", i, u.Name)
		if v := u.HTTP.BearerTokenEnv; v != "" {
			out[v] = f + ".bearer_token_env"
		}
		for _, h := range slices.Sorted(maps.Keys(u.HTTP.HeadersFromEnv)) {
			if v := u.HTTP.HeadersFromEnv[h]; v != "" {
				if _, dup := out[v]; !dup {
					out[v] = f + ".headers_from_env." + h
				}
			}
		}
		credentialSourceEnv(f, u.HTTP, out)
	}
	return out
}

// validateChildEnv checks the variables a stdio upstream's child gets (u's
// stdio.env and stdio.env_allow; n is u's node, f its field prefix, creds
// from credentialEnv): valid names; no code-loading variable unless
// allow_code_env; and, from the gateway's environment (env_allow), no
// other upstream's credential and no CMCP_* variable.
func (l *loader) validateChildEnv(n *yaml.Node, f string, u *Upstream, creds map[string]string) {
	s := u.Stdio
	sn := valueNode(n, "stdio")
	if sn == nil {
		sn = n
	}
	code := false
	codeHint := "remove it, or, if the server needs it, set allow_code_env: true on the upstream: its spawns are then recorded as spawn-unmeasured"
	envNode := valueNode(sn, "env")
	for _, name := range slices.Sorted(maps.Keys(s.Env)) {
		key := keyNode(envNode, name)
		if key == nil {
			key = sn
		}
		field := f + ".stdio.env." + name
		if !envNameRE.MatchString(name) {
			l.errorf(key, f+".stdio.env", "", "%q is not a valid environment variable name", name)
			continue
		}
		if why := CodeLoadingEnv(name); why != "" {
			code = true
			if !u.AllowCodeEnv {
				l.errorf(key, field, codeHint, "%s loads code the pin does not cover: %s", name, why)
			}
		}
	}
	allowNode := valueNode(sn, "env_allow")
	for j, name := range s.EnvAllow {
		node := allowNode
		if node != nil && j < len(node.Content) {
			node = node.Content[j]
		}
		if node == nil {
			node = sn
		}
		field := fmt.Sprintf("%s.stdio.env_allow[%d]", f, j)
		if !envNameRE.MatchString(name) {
			l.errorf(node, field, "", "%q is not a valid environment variable name", name)
			continue
		}
		if setting, ok := creds[name]; ok {
			l.errorf(node, field, "remove it from env_allow; if this server needs a credential of its own, keep it in a variable of its own and list that one",
				"%s holds the credential of another upstream (%s): the child would get that secret", name, setting)
			continue
		}
		if strings.HasPrefix(name, "CMCP_") {
			l.errorf(node, field, "remove it from env_allow; give the child a value it needs with stdio.env",
				"%s: CMCP_* variables are the gateway's own, never copied to a child", name)
			continue
		}
		if why := CodeLoadingEnv(name); why != "" {
			code = true
			if !u.AllowCodeEnv {
				l.errorf(node, field, codeHint, "%s, copied from the gateway's environment, loads code the pin does not cover: %s", name, why)
			}
		}
	}
	if u.AllowCodeEnv && !code {
		at := valueNode(n, "allow_code_env")
		if at == nil {
			at = n
		}
		l.errorf(at, f+".allow_code_env", "remove allow_code_env", "has no effect: neither stdio.env nor stdio.env_allow names a variable that loads code")
	}
}
