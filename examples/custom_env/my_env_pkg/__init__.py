"""An environment that lives outside rlanything: `env.kind: "my_env_pkg.addition:AdditionEnv"`."""
