-- Argo CD resource health for modeldeploy.io/ModelDeployment (docs/install.md, "Argo CD").
-- Register it in argocd-cm as resource.customizations.health.modeldeploy.io_ModelDeployment.
--
-- Reads status only, as the operator writes it (docs/operator.md, "Status"):
--   no status yet, or status.observedGeneration behind metadata.generation -> Progressing (the operator
--     has not acted on this spec yet; what status says is about an older one)
--   phase Failed (a spec the operator refuses), or Degraded (rolled back, aborted, failed back, fallback
--     in traffic, unschedulable pods, model unavailable, reconcile errors)  -> Degraded
--   phase Paused (spec.rollout.paused, or the analysis paused after errors) -> Suspended
--   phase Pending, Progressing, Shadowing                                    -> Progressing
--   phase Healthy                                                            -> Healthy
-- Without a known phase, the conditions Degraded, Progressing and Ready decide, in that order.
-- No condition is waited for that only some ModelDeployments get (ModelAvailable: models from storage;
-- FallbackActive: spec.fallback): a Healthy phase is healthy whatever they say (kserve#3973).
-- Lua 5.1 (Argo CD runs gopher-lua): no string.format on numbers, no integer division.

local function condition(status, kind)
  if type(status.conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- "Reason: message" of a condition, or the fallback text
local function told(c, fallback)
  if c == nil then
    return fallback
  end
  local reason = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    return reason .. ": " .. c.message
  end
  return reason
end

local function result(status, message)
  return { status = status, message = message }
end

local function health(obj)
  local status = obj.status
  if status == nil or (status.phase == nil and status.conditions == nil) then
    return result("Progressing", "Waiting for the modeldeploy operator to report status")
  end
  local degraded = condition(status, "Degraded")
  local progressing = condition(status, "Progressing")
  local ready = condition(status, "Ready")

  -- status describes an older spec until the operator has observed this generation. The one exception:
  -- a Degraded=True condition the operator wrote for this very generation (a status it cannot read, or
  -- a reconcile that failed, leaves observedGeneration where it was).
  local generation = obj.metadata ~= nil and obj.metadata.generation or nil
  local observed = status.observedGeneration
  if generation ~= nil and (observed == nil or observed < generation) then
    local current = degraded ~= nil and degraded.status == "True" and degraded.observedGeneration ~= nil
      and degraded.observedGeneration >= generation
    if current then
      return result("Degraded", told(degraded, "Degraded"))
    end
    return result("Progressing", "Waiting for the modeldeploy operator to observe generation "
      .. tostring(generation) .. " (status is of generation " .. tostring(observed or "none") .. ")")
  end

  local phase = status.phase
  if phase == "Failed" then
    return result("Degraded", "Failed: " .. told(degraded, "the operator refused the spec"))
  end
  if phase == "Degraded" or (degraded ~= nil and degraded.status == "True") then
    return result("Degraded", told(degraded, "Degraded"))
  end
  if phase == "Paused" then
    return result("Suspended", "Paused: " .. told(progressing, "rollout paused"))
  end
  if phase == "Pending" or phase == "Progressing" or phase == "Shadowing" then
    return result("Progressing", phase .. ": " .. told(progressing, told(ready, "waiting for pods")))
  end
  if phase == "Healthy" then
    local message = told(ready, "Healthy")
    if status.revision ~= nil then
      message = "revision " .. status.revision .. ": " .. message
    end
    if type(status.analysis) == "table" and status.analysis.pausedReason ~= nil then
      -- bakeTime with the analysis paused: serving the promoted revision, the bake is not judged
      message = message .. "; " .. status.analysis.pausedReason .. " (kubectl modeldeploy resume)"
    end
    return result("Healthy", message)
  end

  -- no phase this script knows (an operator newer than it): the conditions
  if progressing ~= nil and progressing.status == "True" then
    if progressing.reason == "CanaryPaused" or progressing.reason == "AnalysisPaused" then
      return result("Suspended", told(progressing, "paused"))
    end
    return result("Progressing", told(progressing, "progressing"))
  end
  if ready ~= nil and ready.status == "True" then
    return result("Healthy", told(ready, "Ready"))
  end
  return result("Progressing", told(ready, "Waiting for phase " .. tostring(phase)))
end

return health(obj)
